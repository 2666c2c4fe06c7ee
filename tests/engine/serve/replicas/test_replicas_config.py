"""The `replicas` group: checked like every group, the field named with its allowed values."""

import subprocess
import sys

import pytest
from support import compose_config

from eyas.engine.config import prepare
from eyas.engine.errors import ConfigError

INVALID = [
    (["replicas.num_replicas=0"], "replicas.num_replicas must be an integer >= 1"),
    (["replicas.max_ongoing_requests=0"], "replicas.max_ongoing_requests must be an integer >= 1"),
    (["replicas.retries=-1"], "replicas.retries must be an integer >= 0"),
    (["replicas.cpus_per_replica=0"], "replicas.cpus_per_replica must be a number > 0"),
    (["replicas.first_part_timeout_s=0"], "replicas.first_part_timeout_s must be a number > 0"),
    (["replicas.address=' '"], "replicas.address must be null"),
    (["replicas.prefix.min_match_ratio=1.5"], "replicas.prefix.min_match_ratio must be a number in [0, 1]"),
    (["replicas.prefix.max_imbalance=-1"], "replicas.prefix.max_imbalance must be an integer >= 0"),
    (["replicas.prefix.max_load_ratio=0.5"], "replicas.prefix.max_load_ratio must be a number >= 1"),
    (["replicas.prefix.chunk_chars=2"], "replicas.prefix.chunk_chars must be an integer >= 8"),
]


@pytest.mark.parametrize("overrides,message", INVALID, ids=[" ".join(o) for o, _ in INVALID])
def test_invalid_replicas_values_fail_naming_the_field(overrides, message):
    with pytest.raises(ConfigError) as info:
        prepare(compose_config(["replicas=ray", *overrides], config_name="serve"))
    assert message in str(info.value)


def test_an_unknown_routing_lists_the_allowed_ones():
    with pytest.raises(Exception) as info:
        compose_config(["replicas=ray", "replicas.routing=random"], config_name="serve")
    assert all(name in str(info.value) for name in ("prefix", "power_of_two", "round_robin"))


def test_the_default_server_has_one_process_and_ray_has_two_prefix_routed_replicas():
    assert compose_config([], config_name="serve")["replicas"]["launcher"] == "none"
    replicas = compose_config(["replicas=ray"], config_name="serve")["replicas"]
    assert (replicas["launcher"], replicas["num_replicas"], replicas["routing"]) == ("ray", 2, "prefix")


def test_more_replicas_than_the_local_machine_has_cpus_is_refused_before_ray_starts(tmp_path):
    done = subprocess.run([sys.executable, "-m", "eyas.launch.serve", "replicas=ray", "replicas.num_replicas=4096",
                           "model=tiny"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "replicas.num_replicas (4096) x replicas.cpus_per_replica" in done.stderr
    assert "Ray" not in done.stdout  # no cluster was started
