"""A worker node lost mid-build, on a simulated cluster of its own (`ray.cluster_utils.Cluster`: a head without CPUs,
two worker nodes, each its own raylet and object store), made and torn down by the test: the build completes on the
node left, or a rerun does, and nothing is lost. In the slower group (marked smoke) that CI runs after the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from .. import ray_cluster  # noqa: E402
from ..ray_cluster import DEMO, nodes_cluster, same_entries, teardown  # noqa: E402

single = ray_cluster.single  # module-scoped: the demo corpus built in one process

WAIT_S = 240


def _complete_shards(out: Path) -> int:
    done = 0
    for manifest in (out / "shards").glob("shard-*/manifest.json"):
        try:
            done += json.loads(manifest.read_text(encoding="utf-8")).get("status") == "complete"
        except (OSError, ValueError):
            continue
    return done


@pytest.mark.smoke  # two minutes of a cluster of its own: in the slower group CI runs after the suite
def test_a_worker_node_lost_mid_build_loses_nothing(single, tmp_path, tiny_model_dir):
    """A worker node removed (its raylet and workers killed) once a shard is complete: the build finishes on the
    node left, or, where it cannot, a rerun does; the shards equal the single build's and verify finds them sound."""
    cluster, workers = nodes_cluster(dashboard=False)
    try:
        out = tmp_path / "sharded"
        command = [
            str(Path(sys.executable).with_name("bertknn")),
            *("build", str(DEMO), "--out", str(out), "--model", str(tiny_model_dir), "--engine", "ray"),
            *("--address", cluster.address, "--workers", "2", "--shard-docs", "3"),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + WAIT_S
        while _complete_shards(out) < 1 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.poll() is None, f"the build ended before a node could be lost:\n{first.stdout.read()[-3000:]}"
        lost_at = _complete_shards(out)
        cluster.remove_node(workers[1], allow_graceful=False)
        try:
            first.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
        output = first.stdout.read()
        print(f"node lost with {lost_at} of 15 shards complete; the build then exited {first.returncode}")
        if first.returncode != 0:  # the lost node's work did not come back on its own: a rerun finishes the build
            rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=WAIT_S, check=False)
            assert rerun.returncode == 0, f"{output[-3000:]}\n--- rerun\n{rerun.stdout[-3000:]}{rerun.stderr[-3000:]}"
        assert 1 <= lost_at < 15 and _complete_shards(out) == 15
        same_entries(out, single)
        checked = subprocess.run([command[0], "verify", str(out)], env=env, capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        teardown(cluster)
