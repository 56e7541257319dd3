"""The tune sweep on a Ray cluster: the configurations of :func:`specsim.simulator.tuning.sweep`
run as Ray tasks, results collected as they finish, each row recording the worker that
computed it.

The trace groups, cost model and arrivals the driver read once go into the object store once;
each worker process fetches them on its first task and keeps them, so a task carries only its
(policy, s, k) and the small :class:`~specsim.simulator.tuning.SweepSpec`, and workers on other
nodes need no copy of the trace file. Ray is optional: ``pip install "specsim[ray]"``.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager

from specsim.errors import SpecsimError

#: How to get Ray.
INSTALL = 'pip install "specsim[ray]"'

#: The object-store id of the setup this worker process holds in ``tuning._CACHE``.
_HELD: list = [None]


def import_ray():
    """The ``ray`` module, or :class:`SpecsimError` in one line naming :data:`INSTALL`."""
    try:
        import ray
    except ImportError:
        raise SpecsimError(f"--ray needs ray, which this install lacks: {INSTALL}") from None
    return ray


@contextmanager
def ray_session(address: str, workers: int | None = None):
    """Ray for the length of the block: ``"local"`` starts a private instance on 127.0.0.1
    (no dashboard, no usage stats, ``workers`` CPUs or all of this machine's), anything else
    (``"auto"``, ``ray://host:port``) connects to that cluster. A Ray this process already
    started or joined is used as it is and left running."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if address == "local":
        # Ray reads the opt-out only from the environment (or ~/.ray/config.json).
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        with _loopback_only(ray):
            ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                     num_cpus=workers or os.cpu_count() or 1, log_to_driver=False,
                     logging_level=logging.WARNING)
        addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
        if addresses != {"127.0.0.1"}:
            ray.shutdown()
            raise SpecsimError(f"--ray local: Ray {ray.__version__} started its node on "
                               f"{', '.join(sorted(addresses))}, not on 127.0.0.1 only; give "
                               f"--ray the address of a cluster started with ray start")
    else:
        try:
            ray.init(address=address)
        except (ConnectionError, ValueError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise SpecsimError(f"--ray {address}: cannot connect to the Ray cluster: "
                               f"{message}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


@contextmanager
def _loopback_only(ray):
    """Ray's own switch for a node on the loopback address (what it does on macOS and Windows),
    for the ``ray.init`` of a local instance: its servers then listen on 127.0.0.1 only, not on
    every interface; the raylet and its workers inherit it through the environment. The
    driver's setting is put back afterwards, so a later ``ray.init`` of a cluster is unaffected.
    A Ray without the switch is caught by the address check after ``ray.init``.
    """
    from ray._private import ray_constants

    before = (os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"),
              getattr(ray_constants, "ENABLE_RAY_CLUSTER", None))
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if before[1] is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before[0] is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = before[0]
        if before[1] is not None:
            ray_constants.ENABLE_RAY_CLUSTER = before[1]


def _simulate(setup_box: list, config: tuple) -> dict:
    """One configuration on a Ray worker: the setup from the object store the first time this
    process sees it, then :func:`~specsim.simulator.tuning.run_one` from the cache."""
    import ray

    from specsim.simulator import tuning
    ref = setup_box[0]    # boxed so that Ray passes the reference, not the value, per task
    if _HELD[0] != ref.hex():
        tuning._CACHE.clear()
        tuning._CACHE[config[0]] = ray.get(ref)
        _HELD[0] = ref.hex()
    row = tuning.run_one(*config)
    row["worker"] = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
    return row


def run_configs(configs: list, setup: tuple, address: str, workers: int | None = None,
                progress=None) -> tuple[list, dict]:
    """Every config of ``configs`` (``(spec, policy, s, k)``) simulated on Ray, at most
    ``workers`` at a time when given; returns the rows in the order of ``configs`` and what
    computed them (``address``, distinct ``workers`` and ``nodes``). ``progress(1)`` is called
    as each result arrives."""
    with ray_session(address, workers) as ray:
        task = ray.remote(num_cpus=1)(_simulate)
        box = [ray.put(setup)]
        results: list = [None] * len(configs)
        waiting = list(enumerate(configs))[::-1]
        running: dict = {}
        limit = workers or len(configs)
        while waiting or running:
            while waiting and len(running) < limit:
                index, config = waiting.pop()
                running[task.remote(box, config)] = index
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                results[running.pop(ref)] = ray.get(ref)
                if progress:
                    progress(1)
    computed = {(r["worker"]["node"], r["worker"]["pid"]) for r in results}
    return results, {"address": address, "workers": len(computed),
                     "nodes": len({node for node, _ in computed})}
