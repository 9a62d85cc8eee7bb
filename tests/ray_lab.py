"""A lab of GPU servers on one machine: a real Ray cluster of two nodes (`node1` the
head, `node2`), each with two stand-in GPUs of its own. Each node's raylet (and so every
process Ray starts there) gets through its environment:

- GRIDRUN_NODE_NAME: the name gridrun gives the node (`node2:gpu1`);
- GRIDRUN_STANDIN_NVML: the node's NVML state (tests/standin_nvml/pynvml.py, first on
  its PYTHONPATH): two 80 GiB GPUs with UUIDs of their own, and the processes a test
  puts on them (`Lab.put`);
- GRIDRUN_LEDGER: the node's machine-wide ledger folder (each server has its own
  /dev/shm; here each node a folder);
- GRIDRUN_FAKE_GPUS=1: the runs there train on the CPU, their GPUs declared stand-ins.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1 << 30
GPU_BYTES = 80 * GIB
STANDIN = Path(__file__).resolve().parent / "standin_nvml"


@dataclass
class Node:
    name: str
    nvml: Path
    ledger: Path
    handle: object = None  # ray's node (cluster_utils), None for the head

    def uuid(self, index: int) -> str:
        return f"GPU-{self.name}-{index}"

    def env(self) -> dict[str, str]:
        return {"GRIDRUN_NODE_NAME": self.name, "GRIDRUN_STANDIN_NVML": str(self.nvml),
                "GRIDRUN_LEDGER": str(self.ledger), "GRIDRUN_FAKE_GPUS": "1",
                "PYTHONPATH": os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")])}


@dataclass
class Lab:
    cluster: object
    nodes: dict[str, Node] = field(default_factory=dict)

    def put(self, node: str, procs: dict[int, list[tuple[int, int]]]) -> None:
        """What `node`'s GPUs list now: {GPU index: [(pid, bytes)]} (atomically)."""
        n = self.nodes[node]
        state = {"gpus": [{"uuid": n.uuid(i), "total": GPU_BYTES} for i in range(2)],
                 "procs": {str(i): [list(p) for p in ps] for i, ps in procs.items()}}
        tmp = n.nvml.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(n.nvml)

    def add(self, name: str, folder: Path):
        node = Node(name, folder / f"{name}.nvml.json", folder / f"{name}.ledger")
        node.ledger.mkdir(mode=0o1777, exist_ok=True)
        self.nodes[name] = node
        self.put(name, {})
        node.handle = self.cluster.add_node(
            num_cpus=4, num_gpus=2, object_store_memory=80 * 1024**2, env_vars=node.env())
        self.cluster.wait_for_nodes()
        return node

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.nodes[name].handle, allow_graceful=False)


def start_lab(folder: Path) -> Lab:
    """node1 (the head) and node2, two stand-in GPUs each; the test process is the driver."""
    import ray
    from ray.cluster_utils import Cluster

    head = Node("node1", folder / "node1.nvml.json", folder / "node1.ledger")
    head.ledger.mkdir(mode=0o1777, exist_ok=True)
    lab = Lab(None, {"node1": head})
    lab.put("node1", {})
    lab.cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 4, "num_gpus": 2, "object_store_memory": 80 * 1024**2,
        "include_dashboard": False, "env_vars": head.env()})
    lab.add("node2", folder)
    ray.init(address=lab.cluster.address, log_to_driver=False)
    return lab


def stop_lab(lab: Lab) -> None:
    import ray

    ray.shutdown()
    lab.cluster.shutdown()
