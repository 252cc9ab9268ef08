"""Triton's system shared-memory extension through the real clients: regions made with
``tritonclient.utils.shared_memory``, registered and used over tritonclient.http and
tritonclient.grpc against one in-process server (uvicorn + gRPC, ports picked by the OS), with
inputs and outputs in regions; the refusals (keys, sizes, places), unregistering while a request
is in flight, and the infer role once tokens are on."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from _serving import make_repository
from _wait import wait_for
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from frameserve.repository import ModelRepository
from frameserve.security import TokenTable
from frameserve.server import Server, ServerOptions
from frameserve.service import InferenceService

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tritonclient.grpc as grpcclient

pytestmark = pytest.mark.integration

GATE_PY = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = {gate!r}


class TritonPythonModel:
    """y = x + 1, once the test lets it: it marks "started", then waits for "release"."""

    def execute(self, requests):
        open(os.path.join(GATE, "started"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(GATE, "release")) and time.monotonic() < deadline:
            time.sleep(0.005)  # the model (its own process) polls the test's "release" file
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() + 1)])
            for r in requests
        ]
'''

GATE_CONFIG = """name: "gate"
backend: "python"
max_batch_size: 0
input [{ name: "x", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [ 4 ] }]
"""

A = np.arange(8, dtype=np.float32).reshape(2, 4)
B = np.full((2, 4), 0.5, np.float32)
_KEY_PREFIX = f"fsclient-test_{os.getpid()}_"


def _key(tag: str) -> str:
    return f"/{_KEY_PREFIX}{tag}"


@contextmanager
def _segment(tag: str, byte_size: int) -> Iterator[Any]:
    """A client's POSIX shm object made by tritonclient, destroyed (unlinked) at the end."""
    handle = shm.create_shared_memory_region(tag, _key(tag), byte_size, create_only=True)
    try:
        yield handle
    finally:
        shm.destroy_shared_memory_region(handle)


def _mapped(key: str) -> int:
    """How many mappings of the shm object ``key`` this process holds (client's and server's)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith("/dev/shm" + key))


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, gate_dir: Path) -> Path:
    root = make_repository(tmp_path_factory.mktemp("repo"))
    (root / "gate" / "1").mkdir(parents=True)
    (root / "gate" / "1" / "model.py").write_text(GATE_PY.format(gate=str(gate_dir)))
    (root / "gate" / "config.pbtxt").write_text(GATE_CONFIG)
    return root


def _serving(repo: Path, **options: Any) -> Server:
    service = InferenceService(ModelRepository(repo), threads=1)
    server = Server(service, ServerOptions(host="127.0.0.1", http_port=0, grpc_port=0, metrics_port=None, **options))
    server.start()
    assert server.wait_ready(120)
    return server


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[Server]:
    srv = _serving(repo, allow_client_shm=True)
    yield srv
    srv.stop(timeout_s=30)


@pytest.fixture
def http(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def grpc(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield c
    c.unregister_system_shared_memory()
    c.close()


def _client(protocol: str, http: Any, grpc: Any) -> Any:
    return http if protocol == "http" else grpc


def _module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_regions_round_trip(protocol: str, http: Any, grpc: Any) -> None:
    client, mod = _client(protocol, http, grpc), _module(protocol)
    with _segment(f"in_{protocol}", 4096 + 64) as seg_in, _segment(f"out_{protocol}", 64) as seg_out:
        shm.set_shared_memory_region(seg_in, [A, B], offset=4096 + 0)  # a region 4096 bytes into its object
        client.register_system_shared_memory("in", _key(f"in_{protocol}"), 64, offset=4096)
        client.register_system_shared_memory("out", _key(f"out_{protocol}"), 64)
        status = client.get_system_shared_memory_status()
        if protocol == "http":
            assert sorted(status, key=lambda r: r["name"]) == [
                {"name": "in", "key": _key(f"in_{protocol}"), "offset": 4096, "byte_size": 64},
                {"name": "out", "key": _key(f"out_{protocol}"), "offset": 0, "byte_size": 64},
            ]
        else:
            assert {n: (r.key, r.offset, r.byte_size) for n, r in status.regions.items()} == {
                "in": (_key(f"in_{protocol}"), 4096, 64),
                "out": (_key(f"out_{protocol}"), 0, 64),
            }

        inputs = [mod.InferInput(n, [2, 4], "FP32") for n in ("a", "b")]
        inputs[0].set_shared_memory("in", 32)
        inputs[1].set_shared_memory("in", 32, offset=32)
        outputs = [mod.InferRequestedOutput(n) for n in ("sum", "diff")]
        outputs[0].set_shared_memory("out", 32)
        outputs[1].set_shared_memory("out", 32, offset=32)
        result = client.infer("add", inputs, outputs=outputs)

        np.testing.assert_array_equal(shm.get_contents_as_numpy(seg_out, np.float32, [2, 4]), A + B)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(seg_out, np.float32, [2, 4], offset=32), A - B)
        # the answer names the outputs with their shapes and carries none of their data
        if protocol == "http":
            entries = result.get_response()["outputs"]
            assert [(e["name"], e["datatype"], e["shape"]) for e in entries] == [
                ("sum", "FP32", [2, 4]),
                ("diff", "FP32", [2, 4]),
            ]
            assert all("data" not in e and "parameters" not in e for e in entries)
        else:
            response = result.get_response()
            assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
                ("sum", "FP32", [2, 4]),
                ("diff", "FP32", [2, 4]),
            ]
            assert list(response.raw_output_contents) == [b"", b""]

        client.unregister_system_shared_memory("in")
        assert [r["name"] for r in http.get_system_shared_memory_status()] == ["out"]
        client.unregister_system_shared_memory()
        assert http.get_system_shared_memory_status() == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_one_input_in_a_region_and_one_in_the_request(protocol: str, http: Any, grpc: Any) -> None:
    """gRPC: an input in shared memory takes no raw_input_contents entry (Triton's rule), so the
    one raw entry belongs to the other input; outputs may be mixed too."""
    client, mod = _client(protocol, http, grpc), _module(protocol)
    with _segment(f"mix_{protocol}", 32) as seg, _segment(f"mixout_{protocol}", 32) as seg_out:
        shm.set_shared_memory_region(seg, [B])
        client.register_system_shared_memory("b_region", _key(f"mix_{protocol}"), 32)
        client.register_system_shared_memory("sum_region", _key(f"mixout_{protocol}"), 32)
        a, b = mod.InferInput("a", [2, 4], "FP32"), mod.InferInput("b", [2, 4], "FP32")
        a.set_data_from_numpy(A)
        b.set_shared_memory("b_region", 32)
        want_sum = mod.InferRequestedOutput("sum")
        want_sum.set_shared_memory("sum_region", 32)
        result = client.infer("add", [b, a], outputs=[want_sum, mod.InferRequestedOutput("diff")])
        np.testing.assert_array_equal(result.as_numpy("diff"), A - B)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(seg_out, np.float32, [2, 4]), A + B)


def test_registered_over_http_used_over_grpc(http: Any, grpc: Any) -> None:
    """One registry per server: perf_analyzer registers on one connection and infers on others."""
    with _segment("shared", 64) as seg:
        shm.set_shared_memory_region(seg, [A, B])
        http.register_system_shared_memory("both", _key("shared"), 64)
        assert set(grpc.get_system_shared_memory_status().regions) == {"both"}
        inputs = [grpcclient.InferInput(n, [2, 4], "FP32") for n in ("a", "b")]
        inputs[0].set_shared_memory("both", 32)
        inputs[1].set_shared_memory("both", 32, offset=32)
        np.testing.assert_array_equal(grpc.infer("add", inputs).as_numpy("sum"), A + B)
        grpc.unregister_system_shared_memory("both")
        assert http.get_system_shared_memory_status() == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_tensors_in_regions(protocol: str, http: Any, grpc: Any) -> None:
    client, mod = _client(protocol, http, grpc), _module(protocol)
    text = np.array([[b"shared"], [b""], ["memory \u00e9".encode()]], dtype=object)
    wire = serialize_byte_tensor(text)
    size = len(wire.item())
    with _segment(f"txt_{protocol}", size) as seg, _segment(f"txtout_{protocol}", 256) as seg_out:
        shm.set_shared_memory_region(seg, [wire])
        client.register_system_shared_memory("text_in", _key(f"txt_{protocol}"), size)
        client.register_system_shared_memory("text_out", _key(f"txtout_{protocol}"), 256)
        inp = mod.InferInput("text", [3, 1], "BYTES")
        inp.set_shared_memory("text_in", size)
        out = mod.InferRequestedOutput("echo")
        out.set_shared_memory("text_out", 256)
        client.infer("strings", [inp], outputs=[out])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(seg_out, np.object_, [3, 1]), text)
        # a byte size that is not the BYTES data's is refused
        inp.set_shared_memory("text_in", size - 1)
        with pytest.raises(InferenceServerException, match="BYTES"):
            client.infer("strings", [inp], outputs=[out])


# -- refusals ------------------------------------------------------------------------------------


def _refused(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_register_refuses_bad_keys_and_sizes(protocol: str, http: Any, grpc: Any, tmp_path: Path) -> None:
    client = _client(protocol, http, grpc)
    bad_request = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    with _segment(f"small_{protocol}", 100):
        cases = [
            ("../etc/passwd", 0, 10, "one POSIX shared memory name"),
            ("/dev/shm/x", 0, 10, "one POSIX shared memory name"),
            ("/frameserve-1234-abcd", 0, 10, "only keys starting with '/fsclient-'"),
            ("frameserve-pb-1-00", 0, 10, "only keys starting with '/fsclient-'"),
            ("/sem.mp-abcd", 0, 10, "only keys starting with '/fsclient-'"),
            ("/another_programs_segment", 0, 10, "only keys starting with '/fsclient-'"),
            (_key("missing"), 0, 10, "no shared memory object"),
            (_key(f"small_{protocol}"), 0, 101, "past the end"),  # byte_size bigger than the object
            (_key(f"small_{protocol}"), 100, 1, "past the end"),  # offset at its end
            (_key(f"small_{protocol}"), 1 << 40, 1, "past the end"),  # offset far past it
            (_key(f"small_{protocol}"), 0, 0, "byte_size must be > 0"),
        ]
        for key, offset, byte_size, message in cases:
            err = _refused(
                lambda k=key, n=byte_size, o=offset: client.register_system_shared_memory("r", k, n, offset=o)
            )
            assert message in err.message(), (key, err.message())
            assert str(err.status()) == bad_request, (key, err.status())
        link = Path("/dev/shm", f"{_KEY_PREFIX}link_{protocol}")
        link.symlink_to(tmp_path / "target")
        (tmp_path / "target").write_bytes(b"\0" * 100)
        try:
            err = _refused(lambda: client.register_system_shared_memory("r", "/" + link.name, 10))
            assert "symbolic link" in err.message()
        finally:
            link.unlink()
        assert http.get_system_shared_memory_status() == []

        client.register_system_shared_memory("r", _key(f"small_{protocol}"), 100)
        err = _refused(lambda: client.register_system_shared_memory("r", _key(f"small_{protocol}"), 10))
        assert "already registered" in err.message()
        assert str(err.status()) == ("400" if protocol == "http" else "StatusCode.ALREADY_EXISTS")
        err = _refused(lambda: client.get_system_shared_memory_status("nope"))
        assert "Unable to find system shared memory region: 'nope'" in err.message()
        assert str(err.status()) == ("404" if protocol == "http" else "StatusCode.NOT_FOUND")
        client.unregister_system_shared_memory("nope")  # an unknown name is not an error (Triton)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_refuses_places_outside_the_region_and_small_outputs(protocol: str, http: Any, grpc: Any) -> None:
    client, mod = _client(protocol, http, grpc), _module(protocol)
    with _segment(f"io_{protocol}", 64) as seg:
        shm.set_shared_memory_region(seg, [A, B])
        client.register_system_shared_memory("io", _key(f"io_{protocol}"), 64)

        def run(a_place: tuple[str, int, int], out_place: tuple[str, int, int] | None = None) -> Any:
            a, b = mod.InferInput("a", [2, 4], "FP32"), mod.InferInput("b", [2, 4], "FP32")
            a.set_shared_memory(a_place[0], a_place[1], offset=a_place[2])
            b.set_shared_memory("io", 32, offset=32)
            out = mod.InferRequestedOutput("sum")
            if out_place is not None:
                out.set_shared_memory(out_place[0], out_place[1], offset=out_place[2])
            return client.infer("add", [a, b], outputs=[out])

        np.testing.assert_array_equal(run(("io", 32, 0)).as_numpy("sum"), A + B)
        cases = [
            (("io", 32, 40), None, "Invalid offset + byte size"),  # runs past the region's 64 bytes
            (("io", 32, 64), None, "Invalid offset"),
            (("io", 28, 0), None, "takes 32 bytes"),  # not what [2, 4] FP32 takes
            (("nope", 32, 0), None, "Unable to find shared memory region: 'nope'"),
            (("io", 32, 0), ("io", 16, 0), "should be at least 32 bytes to hold the results"),
            (("io", 32, 0), ("io", 32, 48), "Invalid offset + byte size"),
        ]
        for a_place, out_place, message in cases:
            err = _refused(lambda a=a_place, o=out_place: run(a, o))
            assert message in err.message(), (a_place, out_place, err.message())
        # a too small output region left the region as it was (nothing is written past the answer)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(seg, np.float32, [2, 4]), A)


def test_cuda_shared_memory_is_refused_but_unregistering_it_succeeds(http: Any, grpc: Any, server: Server) -> None:
    """perf_analyzer unregisters both kinds before a --shared-memory system run."""
    http.unregister_cuda_shared_memory()
    grpc.unregister_cuda_shared_memory()
    assert http.get_cuda_shared_memory_status() == []
    assert not grpc.get_cuda_shared_memory_status().regions
    err = _refused(lambda: grpc.register_cuda_shared_memory("c", b"\0" * 64, 0, 64))
    assert str(err.status()) == "StatusCode.UNIMPLEMENTED" and "CUDA shared memory is not supported" in err.message()
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", trust_env=False) as raw:
        answer = raw.post(
            "/v2/cudasharedmemory/region/c/register", json={"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 1}
        )
        assert answer.status_code == 400 and "CUDA shared memory is not supported" in answer.json()["error"]
        assert raw.post("/v2/systemsharedmemory/status").status_code == 405  # status is a GET, as in Triton


def test_server_metadata_lists_the_extension(http: Any, grpc: Any) -> None:
    assert "system_shared_memory" in http.get_server_metadata()["extensions"]
    assert "system_shared_memory" in grpc.get_server_metadata().extensions
    assert "cuda_shared_memory" not in http.get_server_metadata()["extensions"]


# -- in flight -----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unregister_while_a_request_is_in_flight(
    protocol: str, http: Any, grpc: Any, gate_dir: Path, server: Server
) -> None:
    """The region goes at once for new requests; the request holding it finishes, writes its
    output into it, and only then does the server unmap it."""
    client, mod = _client(protocol, http, grpc), _module(protocol)
    for marker in ("started", "release"):
        (gate_dir / marker).unlink(missing_ok=True)
    x = np.array([1, 2, 3, 4], np.float32)
    with _segment(f"gate_in_{protocol}", 16) as seg_in, _segment(f"gate_out_{protocol}", 16) as seg_out:
        shm.set_shared_memory_region(seg_in, [x])
        client.register_system_shared_memory("gx", _key(f"gate_in_{protocol}"), 16)
        client.register_system_shared_memory("gy", _key(f"gate_out_{protocol}"), 16)
        out_key = _key(f"gate_out_{protocol}")
        assert _mapped(out_key) == 2  # the client's mapping and the server's

        def request(on: Any) -> Any:
            inp = mod.InferInput("x", [4], "FP32")
            inp.set_shared_memory("gx", 16)
            out = mod.InferRequestedOutput("y")
            out.set_shared_memory("gy", 16)
            return on.infer("gate", [inp], outputs=[out])

        def in_flight() -> Any:  # its own client: tritonclient.http's may not change threads
            port = server.http_port if protocol == "http" else server.grpc_port
            own = mod.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                return request(own)
            finally:
                own.close()

        results: list[Any] = []
        worker = threading.Thread(target=lambda: results.append(_outcome(in_flight)))
        worker.start()
        try:
            wait_for((gate_dir / "started").exists, 30, "the gate model started")
            client.unregister_system_shared_memory()  # returns at once, the request still running
            assert http.get_system_shared_memory_status() == []
            err = _refused(lambda: request(client))  # unusable for new requests at once
            assert "Unable to find shared memory region: 'gx'" in err.message()
            assert _mapped(out_key) == 2  # still mapped for the request in flight
        finally:
            (gate_dir / "release").touch()
            worker.join(60)
        assert results and not isinstance(results[0], BaseException), results
        np.testing.assert_array_equal(shm.get_contents_as_numpy(seg_out, np.float32, [4]), x + 1)
        wait_for(lambda: _mapped(out_key) == 1, 30, "the server unmapped the unregistered region")


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except BaseException as exc:  # noqa: BLE001 - reported to the test thread
        return exc


def test_the_server_never_unlinks_a_clients_object(repo: Path) -> None:
    """Stopping the server unmaps the regions; the client's objects stay (no resource tracker)."""
    srv = _serving(repo, allow_client_shm=True)
    with _segment("kept", 16) as seg:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        c.register_system_shared_memory("kept", _key("kept"), 16)
        c.close()
        assert _mapped(_key("kept")) == 2
        srv.stop(timeout_s=30)
        assert _mapped(_key("kept")) == 1
        assert Path("/dev/shm", _key("kept").lstrip("/")).exists()
        shm.set_shared_memory_region(seg, [np.ones(4, np.float32)])  # still the client's, still usable


# -- off by default, and the infer role ----------------------------------------------------------


def test_without_allow_client_shm_everything_is_refused(repo: Path) -> None:
    srv = _serving(repo)
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        with _segment("off", 64) as seg:
            shm.set_shared_memory_region(seg, [A, B])
            for client in (http, grpc):
                err = _refused(lambda c=client: c.register_system_shared_memory("off", _key("off"), 64))
                assert "--allow-client-shm" in err.message()
            assert "UNIMPLEMENTED" in str(_refused(grpc.get_system_shared_memory_status).status())
            for mod, client in ((httpclient, http), (grpcclient, grpc)):
                inputs = [mod.InferInput(n, [2, 4], "FP32") for n in ("a", "b")]
                inputs[0].set_shared_memory("off", 32)
                inputs[1].set_shared_memory("off", 32, offset=32)
                assert "--allow-client-shm" in _refused(lambda c=client, i=inputs: c.infer("add", i)).message()
        assert "system_shared_memory" not in http.get_server_metadata()["extensions"]
        http.close()
        grpc.close()
    finally:
        srv.stop(timeout_s=30)


INFER_TOKEN = "infer-token-" + "i" * 24
JOBS_TOKEN = "jobs-token-" + "j" * 24


def test_shared_memory_needs_the_infer_role_once_tokens_are_on(repo: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{INFER_TOKEN} infer\n{JOBS_TOKEN} jobs\n")
    tokens.chmod(0o600)
    srv = _serving(repo, allow_client_shm=True, tokens=TokenTable.from_file(tokens))
    try:
        with _segment("guarded", 64):
            for token, http_status, grpc_status in (
                (None, "401", "StatusCode.UNAUTHENTICATED"),
                (JOBS_TOKEN, "403", "StatusCode.PERMISSION_DENIED"),
            ):
                headers = {} if token is None else {"authorization": f"Bearer {token}"}
                http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
                grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
                for client, status in ((http, http_status), (grpc, grpc_status)):
                    calls: list[Callable[[], Any]] = [
                        partial(client.register_system_shared_memory, "g", _key("guarded"), 64, headers=headers),
                        partial(client.get_system_shared_memory_status, headers=headers),
                        partial(client.unregister_system_shared_memory, headers=headers),
                    ]
                    for call in calls:
                        assert str(_refused(call).status()) == status
                http.close()
                grpc.close()
            headers = {"authorization": f"Bearer {INFER_TOKEN}"}
            http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
            http.register_system_shared_memory("g", _key("guarded"), 64, headers=headers)
            assert [r["name"] for r in http.get_system_shared_memory_status(headers=headers)] == ["g"]
            assert set(grpc.get_system_shared_memory_status(headers=headers).regions) == {"g"}
            grpc.unregister_system_shared_memory(headers=headers)
            assert http.get_system_shared_memory_status(headers=headers) == []
            http.close()
            grpc.close()
    finally:
        srv.stop(timeout_s=30)


ALICE_TOKEN = "alice-token-" + "a" * 24
BOB_TOKEN = "bob-token-" + "b" * 26
OPS_TOKEN = "ops-token-" + "o" * 26


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "http-workers-2"])
def tenants_server(
    request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """Three tenants (alice and bob: infer; ops: admin), in one process or with two front ends."""
    tokens = tmp_path_factory.mktemp("tenants") / "tokens.txt"
    tokens.write_text(f"{ALICE_TOKEN} infer alice\n{BOB_TOKEN} infer bob\n{OPS_TOKEN} admin ops\n")
    tokens.chmod(0o600)
    workers = int(request.param)
    srv = _serving(
        repo, allow_client_shm=True, tokens=TokenTable.from_file(tokens), http_workers=workers, grpc_workers=workers
    )
    yield srv
    srv.stop(timeout_s=30)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_regions_belong_to_their_tenant(tenants_server: Server, protocol: str) -> None:
    """Bob cannot list, read, overwrite or unregister Alice's regions, even under the same region
    name; his unregister-all leaves hers; an admin sees every tenant's."""
    srv, mod = tenants_server, _module(protocol)
    port = srv.http_port if protocol == "http" else srv.grpc_port
    client = mod.InferenceServerClient(f"127.0.0.1:{port}")
    alice, bob, ops = ({"authorization": f"Bearer {t}"} for t in (ALICE_TOKEN, BOB_TOKEN, OPS_TOKEN))

    def names(headers: dict[str, str]) -> list[str]:
        status = client.get_system_shared_memory_status(headers=headers)
        return sorted(r["name"] for r in status) if protocol == "http" else sorted(status.regions)

    with (
        _segment(f"t_alice_{protocol}", 64) as seg_a,
        _segment(f"t_bob_{protocol}", 64) as seg_b,
        _segment(f"t_out_{protocol}", 64) as seg_out,
    ):
        shm.set_shared_memory_region(seg_a, [A, A])
        shm.set_shared_memory_region(seg_b, [B, B])
        shm.set_shared_memory_region(seg_out, [np.zeros_like(A), np.zeros_like(A)])
        client.register_system_shared_memory("data", _key(f"t_alice_{protocol}"), 64, headers=alice)
        client.register_system_shared_memory("alice-out", _key(f"t_out_{protocol}"), 64, headers=alice)
        client.register_system_shared_memory("data", _key(f"t_bob_{protocol}"), 64, headers=bob)  # same name
        try:
            assert names(alice) == ["alice-out", "data"]
            assert names(bob) == ["data"]
            assert names(ops) == (
                ["alice-out", "data", "data"] if protocol == "http" else ["alice/alice-out", "alice/data", "bob/data"]
            )
            with pytest.raises(InferenceServerException):  # another tenant's region is not found
                client.get_system_shared_memory_status("alice-out", headers=bob)

            inputs = [mod.InferInput(n, [2, 4], "FP32") for n in ("a", "b")]
            inputs[0].set_shared_memory("data", 32)
            inputs[1].set_shared_memory("data", 32, offset=32)
            got = client.infer("add", inputs, headers=bob)  # bob's "data" is bob's segment
            np.testing.assert_array_equal(got.as_numpy("sum"), B + B)

            outputs = [mod.InferRequestedOutput("sum")]
            outputs[0].set_shared_memory("alice-out", 32)
            err = _refused(lambda: client.infer("add", inputs, outputs=outputs, headers=bob))
            assert "alice-out" in err.message() and "Unable to find" in err.message()
            np.testing.assert_array_equal(shm.get_contents_as_numpy(seg_out, np.float32, [2, 4]), np.zeros_like(A))

            client.unregister_system_shared_memory("alice-out", headers=bob)  # not his: nothing happens
            client.unregister_system_shared_memory(headers=bob)  # all of his, none of hers
            assert names(bob) == [] and names(alice) == ["alice-out", "data"]
            got = client.infer("add", inputs, headers=alice)
            np.testing.assert_array_equal(got.as_numpy("sum"), A + A)
        finally:
            client.unregister_system_shared_memory(headers=ops)  # admin: every tenant's
            assert names(alice) == [] and names(ops) == []
            client.close()
