"""A run on several devices on Ray: one placement group, on one node.

gridrun places a run on `devices` = n as on one server: n slots of one node
(engine/placement.pick keeps a gang on one node), launched once on the gang's slot,
whose environment lists its GPUs (CUDA_VISIBLE_DEVICES "0,1"); the run's process is
rank 0 and starts ranks 1..n-1 itself (train/ranks.py), gloo on the CPU, NCCL on GPUs.
Ray is told what those ranks take: the run is one placement group of n bundles, a CPU
each (no Ray GPU: gridrun's slots hand out the GPUs), on the gang's node, and the run's
task is scheduled into its first bundle; the others hold the CPUs of the ranks Ray does
not start itself.

Pinning a group to a node (Ray 2.60, ray/util/placement_group.py): every node carries
the label `ray.io/node-id` (its id); a STRICT_PACK group whose every bundle selects that
label (`bundle_label_selector`) is placed on that node or nowhere: it stays PENDING while
the node lacks room, and a node that leaves leaves it RESCHEDULING for that node alone.
`_soft_target_node_id` is only a hint (a group that does not fit there goes to another
node), and a task cannot take both a placement group and node affinity. Both checked on
a local two-node `ray.cluster_utils.Cluster`.

A group lives as long as its run's task: it is removed when the run ends, is cancelled
or its node is lost (the backend's `poll` sees the task end: `release`), when a launch
fails, and at `close`. Groups belong to the engine's Ray driver (no detached lifetime),
so an engine that dies takes them with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from gridrun.engine.backends.base import Refused, Slot

log = logging.getLogger("gridrun.engine")

NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id
CPUS_A_RANK = 1.0  # what each rank reserves; the run's task asks for as much (num_cpus=1)


def bundles(devices: int) -> list[dict[str, float]]:
    """A group's bundles: a CPU for each rank, no GPU (gridrun hands those out)."""
    return [{"CPU": CPUS_A_RANK} for _ in range(devices)]


def node_name(slot: Slot) -> str:
    """How people know the slot's node: the part of its first member's name before ':'."""
    return slot.parts[0].name.partition(":")[0]


def node_cpus(node: str) -> float | None:
    """The CPUs Ray counts on `node` (its total), None if it is not alive."""
    for n in ray.nodes():
        if n.get("NodeID") == node and n.get("Alive"):
            return float(n.get("Resources", {}).get("CPU", 0))
    return None


class Gangs:
    """This engine's placement groups, by run id: one for each run on several devices."""

    def __init__(self) -> None:
        self.groups: dict[str, Any] = {}

    def submit(self, run_id: str, slot: Slot, devices: int,
               submit: Callable[..., Any]) -> Any:
        """`submit(**options)` the run's task: pinned to its slot's node (`node=`) for one
        device; for n, into a new group of n bundles on that node. A node whose Ray CPUs
        are fewer than n could never hold the group: refused in one line."""
        if devices <= 1 or slot.node is None:
            return submit(node=slot.node)
        cpus = node_cpus(slot.node)
        if cpus is not None and cpus < devices * CPUS_A_RANK:
            raise Refused(f"devices = {devices} reserves {devices} CPUs on one Ray node (one a "
                          f"rank) and {node_name(slot)} has {cpus:g}: lower devices, or start "
                          f"that node with more (ray start --num-cpus {devices})")
        self.release(run_id)  # a group left from an earlier launch of the run
        group = placement_group(bundles(devices), strategy="STRICT_PACK",
                                name=f"gridrun-{run_id}",
                                bundle_label_selector=[{NODE_LABEL: slot.node}] * devices)
        self.groups[run_id] = group
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=False)
        try:
            return submit(scheduling_strategy=strategy)
        except BaseException:
            self.release(run_id)
            raise

    def release(self, run_id: str) -> None:
        """Remove the run's group, if it has one (its reservation ends with it)."""
        group = self.groups.pop(run_id, None)
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception as e:  # the cluster is gone: the group went with it
                log.debug("%s: its placement group was not removed: %s", run_id, e)

    def close(self) -> None:
        for run_id in list(self.groups):
            self.release(run_id)
