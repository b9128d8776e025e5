"""Workers' output in Ray mode, sorted as in-process: dynrag's own log records show on the driver's terminal;
everything else a worker prints (vLLM, torch, Triton, Lucene, Ray's worker warnings) goes to the driver's
`ray_workers` logger (not under "ray", whose records Ray keeps to itself), which the answer job diverts to
OUT/dynrag.log (jobs/quiet.py).

Ray streams each worker's stdout and stderr to the driver (`log_to_driver`), whose handler prints the lines
on the terminal. `own_worker_logging` (in each actor) marks dynrag's records; `route_worker_logs` replaces
Ray's handler on the driver (Ray 2.60's `global_worker_stdstream_dispatcher`, the hook Ray's own printing
uses, reached through platform_shims/compat.py; where it is missing, Ray's printing stays)."""

from __future__ import annotations

import logging
import re
import sys

log = logging.getLogger(__name__)

OWN = ("pipeline", "indexing", "platform_shims", "jobs")  # the loggers whose records are dynrag's own
MARK = "dynrag|"  # starts each line a worker's own record writes
_OWN_LINE = re.compile(rf"^{re.escape(MARK)}(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")
OWN_HANDLER = "dynrag_worker_logs"


def own_worker_logging(level: int = logging.INFO) -> None:
    """In a Ray actor: write dynrag's own records (at `level` and above) to stderr as marked lines. Elsewhere
    (an actor's class built in the driver's process by a test) nothing changes."""
    import ray

    if not ray.is_initialized() or not ray.get_runtime_context().get_actor_id():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(MARK + "%(levelname)s %(name)s: %(message)s"))
    for name in OWN:
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level)
        logger.propagate = False


def route_worker_logs(data: dict) -> None:
    """One batch of a worker's lines (Ray's dict: pid, ip, actor_name or task_name, lines): each of dynrag's
    own records logged again under its logger's name, every other line under `ray_workers`."""
    who = data.get("actor_name") or data.get("task_name")
    where = f"({who + ' ' if who else ''}pid={data.get('pid')}, {data.get('ip')})"
    library = logging.getLogger("ray_workers")
    if data.get("pid") == "autoscaler":  # its status dumps are not shown, its events (nodes added) are
        from platform_shims.compat import autoscaler_events

        for event in autoscaler_events(data.get("lines", [])):
            log.info("autoscaler: %s", event)
        return
    for line in data.get("lines", []):
        own = _OWN_LINE.match(line)
        if own:
            level, name, message = own.groups()
            logging.getLogger(name).log(getattr(logging, level), "%s %s", where, message)
        else:
            library.info("%s %s", where, line)


def route_ray_worker_output() -> bool:
    """On the driver, after ray.init: send the workers' lines through `route_worker_logs` instead of Ray's
    printing. False (Ray's printing left as it is) where this Ray has no such hook."""
    from platform_shims.compat import route_worker_output

    return route_worker_output(OWN_HANDLER, route_worker_logs)  # replaces the one an earlier ray.init added
