"""The papers' tables: `dynrag eval-drrag`, `eval-pairs`, `eval-dragin`, `eval-erm4`."""
