"""The Ray cluster behind ``encode.engine: ray`` and ``score.engine: ray`` (the ``ray`` extra).

:func:`connect` joins the cluster at ``address`` (a param), else at ``$RAY_ADDRESS``, else
starts a local one on this machine's cores. A process that already called ``ray.init``
(a test session, a notebook) keeps its cluster. Workers import the driver's code from the
driver's folders first (:func:`worker_env`), so a ``callable:`` backbone of the project root
works on this machine's workers; on other nodes, install the project (or share its folder).
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType
from typing import Any

from recallk.errors import InputError, MissingExtraError

log = logging.getLogger(__name__)


def import_ray(what: str) -> ModuleType:
    """``ray`` with Ray Data, or a :class:`MissingExtraError` naming ``what`` needs it."""
    try:
        import ray
        import ray.data  # noqa: F401  (the [data] part of the extra)
    except ImportError as exc:
        raise MissingExtraError(what, "ray", "ray[data]", exc) from None
    return ray


def worker_env() -> dict[str, Any]:
    """The job's ``runtime_env``: workers search the driver's working directory and ``sys.path`` for
    modules first, as the driver does (folders a node lacks are skipped), then their own PYTHONPATH."""
    paths = [os.getcwd(), *(p for p in sys.path if p)]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join([*dict.fromkeys(paths), "${PYTHONPATH}"])}}


def connect(address: str | None, what: str) -> ModuleType:
    """Join or start the cluster (see the module docstring) and return ``ray``.

    Parameters
    ----------
    address : str or None
        ``ray://host:10001``, ``host:6379`` or ``auto``; None: ``$RAY_ADDRESS``, else a local cluster.
    what : str
        The param that asked for Ray, for messages (``encode.engine: ray``).

    Raises
    ------
    MissingExtraError
        Ray is not installed.
    InputError
        No cluster answers at the address.
    """
    ray = import_ray(what)
    ray.data.DataContext.get_current().enable_progress_bars = False  # the driver's own Progress reports it
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    try:
        ray.init(address=address, runtime_env=worker_env(), **options)
    except (ConnectionError, TimeoutError, ValueError) as exc:
        where = f"at {address!r}" if address else "on this machine"
        raise InputError(f"`{what}`: cannot start or reach a Ray cluster {where} ({exc}); start one with "
                         "`ray start --head`, fix the address (RAY_ADDRESS or the engine's `ray.address` param), "
                         "or leave both unset to start a local cluster.") from None
    resources = ray.cluster_resources()
    log.info("%s: %s CPUs, %s GPUs", f"joined the Ray cluster at {address}" if address else
             "started a local Ray cluster", resources.get("CPU", 0), resources.get("GPU", 0))
    return ray
