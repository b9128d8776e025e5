#!/usr/bin/env bash
# Headless Chromium for the HTML report test (tests/pipeline/evaluation/test_report_html.py): Debian's `chromium` package.
# Idempotent; non-interactive (CI has no stdin). Needs root or passwordless sudo. Prints the binary's path.
set -euo pipefail
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then command -v "$b"; exit 0; fi
done
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "install_chromium: not root and no passwordless sudo; install Debian's 'chromium' package" >&2; exit 1; fi
fi
export DEBIAN_FRONTEND=noninteractive
APT="$SUDO apt-get -o DPkg::Lock::Timeout=600 -y -q"
$APT install --no-install-recommends chromium >&2 || { $APT update >&2 && $APT install --no-install-recommends chromium >&2; }
command -v chromium
