"""graphs.mode=auto behind the server: it answers from the start, eager, and its graph runners swap in
between two engine steps once the background compile ends, with no restart and the same greedy text."""

import json
import time

import pytest
from support.server_process import MODEL, SERVED_PROMPTS, ServerProcess


@pytest.mark.slow  # a real background compile of the tiny pair's packages: a few minutes
def test_the_server_answers_at_once_and_gets_its_graphs_without_a_restart(tmp_path):
    server = ServerProcess("graphs.mode=auto", f"graphs.cache_dir={tmp_path}")
    try:
        body = json.dumps({"model": MODEL, "prompt": SERVED_PROMPTS[0], "max_tokens": 24, "temperature": 0}).encode()
        status, first = server.post("/v1/completions", body)
        assert status == 200 and server.metric("eyas_graphs_swapped_in") == 0
        deadline = time.monotonic() + 900
        while server.metric("eyas_graphs_swapped_in") == 0:  # the engine checks the compile between its steps
            assert time.monotonic() < deadline, "the graph runners never swapped in"
            status, reply = server.post("/v1/completions", body)
            assert status == 200 and reply["choices"][0]["text"] == first["choices"][0]["text"]
            time.sleep(2)
        status, after = server.post("/v1/completions", body)
        assert status == 200 and after["choices"][0]["text"] == first["choices"][0]["text"]
        assert server.metric("eyas_graphs_compile_seconds") > 0 and server.metric("eyas_graphs_packages_compiled") >= 2
    finally:
        server.stop()
