"""The profile lines of bench/serving.py's add_sub figures: what the frameworks cost alone (an
empty uvicorn app, an empty grpc.aio handler and an empty handler on grpcio's thread-pool
server, pinned as ``serve --grpc-cpus auto`` pins it, answering perf_analyzer) and where frameserve's
own code spends one request (measured in process)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _peer import free_ports  # noqa: E402
from _serving_common import REPO  # noqa: F401  (puts tests/ on sys.path)

FLOOR_SERVER = r'''
"""The framework floor: uvicorn (HTTP), grpc.aio and grpcio's thread-pool server (gRPC)
answering add_sub's perf_analyzer calls with a fixed response, no model, no codec (bench/serving.py)."""
import asyncio, json, sys
import grpc, numpy as np, uvicorn, uvloop
from frameserve._proto import grpc_service_pb2 as pb
from frameserve.protocol.grpc import config_message

HTTP, GRPC, GRPC_SYNC = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
count = [0]
names = [("INPUT0", "OUTPUT0"), ("INPUT1", "OUTPUT1")]
cfg = {"name": "add_sub", "max_batch_size": 8, "backend": "python", "dynamic_batching": {},
       "input": [{"name": i, "data_type": "TYPE_FP32", "dims": [16]} for i, _ in names],
       "output": [{"name": o, "data_type": "TYPE_FP32", "dims": [16]} for _, o in names]}
meta = {"name": "add_sub", "versions": ["1"], "platform": "python",
        "inputs": [{"name": i, "datatype": "FP32", "shape": [-1, 16]} for i, _ in names],
        "outputs": [{"name": o, "datatype": "FP32", "shape": [-1, 16]} for _, o in names]}
head = json.dumps({"model_name": "add_sub", "model_version": "1", "outputs": [
    {"name": o, "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}} for _, o in names]}).encode()
BODY = head + np.zeros(32, np.float32).tobytes()
INFER_HEADERS = [(b"content-type", b"application/octet-stream"), (b"inference-header-content-length", str(len(head)).encode()),
                 (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    path = scope["path"]
    if path.endswith("/infer"):
        count[0] += 1
        await send({"type": "http.response.start", "status": 200, "headers": INFER_HEADERS})
        await send({"type": "http.response.body", "body": BODY})
        return
    doc = ({"model_stats": [{"inference_count": count[0]}]} if path.endswith("/stats") else cfg if path.endswith("/config")
           else meta if path.startswith("/v2/models") else {"name": "floor", "version": "1", "extensions": []})
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


response = pb.ModelInferResponse(model_name="add_sub", model_version="1")
for _, o in names:
    response.outputs.add(name=o, datatype="FP32", shape=[1, 16])
    response.raw_output_contents.append(np.zeros(16, np.float32).tobytes())
RESPONSE = response.SerializeToString()
message = pb.ModelMetadataResponse(name="add_sub", versions=["1"], platform="python")
for i, o in names:
    message.inputs.add(name=i, datatype="FP32", shape=[-1, 16])
    message.outputs.add(name=o, datatype="FP32", shape=[-1, 16])


async def model_infer(data, context):
    count[0] += 1
    return RESPONSE

fixed = {"ModelMetadata": message.SerializeToString(),
         "ModelConfig": pb.ModelConfigResponse(config=config_message(cfg)).SerializeToString(),
         "ServerMetadata": pb.ServerMetadataResponse(name="floor", version="1").SerializeToString()}


def answer(data):
    async def handler(request, context):
        return data
    return grpc.unary_unary_rpc_method_handler(handler)


def model_infer_sync(data, context):
    count[0] += 1
    return RESPONSE


def sync_server():
    """grpcio's thread-pool server, as serve runs it (--grpc-cpus auto: its Python threads
    started from a thread on the last CPU, so they inherit it)."""
    import concurrent.futures, os
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[-1]})
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    handlers = {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer_sync),
                **{k: grpc.unary_unary_rpc_method_handler(lambda r, c, d=v: d) for k, v in fixed.items()}}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))
    server.add_insecure_port(f"127.0.0.1:{GRPC_SYNC}")
    server.start()
    SERVERS.append(server)


SERVERS = []


async def main():
    import threading
    starter = threading.Thread(target=sync_server)
    starter.start()
    starter.join()
    server = grpc.aio.server()
    handlers = {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer), **{k: answer(v) for k, v in fixed.items()}}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))
    server.add_insecure_port(f"127.0.0.1:{GRPC}")
    await server.start()
    config = uvicorn.Config(app, host="127.0.0.1", port=HTTP, lifespan="off", log_level="warning", access_log=False)
    await uvicorn.Server(config).serve()

uvloop.run(main())
'''


@dataclass
class Floor:
    ports: dict[str, int]  # uvicorn, grpc.aio
    pid: int
    sync_ports: dict[str, int]  # uvicorn, grpcio's thread-pool server (serve's gRPC mode)


@contextmanager
def floor_server(work: Path) -> Iterator[Floor]:
    """uvicorn, grpc.aio and grpcio's thread-pool server answering add_sub with a fixed
    response: what the frameworks cost alone."""
    script = work / "floor_server.py"
    script.write_text(FLOOR_SERVER)
    http, grpc_port, grpc_sync = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(http), str(grpc_port), str(grpc_sync)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{http}/v2", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"the floor server did not start: {proc.stderr.read().decode()[-1500:] if proc.stderr else ''}"
                )
            time.sleep(0.2)
        yield Floor({"HTTP": http, "gRPC": grpc_port}, proc.pid, {"HTTP": http, "gRPC": grpc_sync})
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def add_sub_profile(repo: Path, calls: int = 3000) -> dict[str, str]:
    """Where one add_sub request's CPU goes in frameserve's own code, measured in this process
    (thread CPU per call, best of 5): the HTTP fast path and its parts, the gRPC ModelInfer path."""
    import asyncio

    from frameserve.protocol.grpc import GrpcInferenceServicer
    from frameserve.protocol.http import codec, create_app
    from frameserve.repository import ModelRepository
    from frameserve.service import InferenceService

    service = InferenceService(ModelRepository(repo), threads=1)
    service.load_models(["add_sub"])
    here = service.client(inline_under_us=1e9)  # runs on this thread once measured
    try:
        app = create_app(service)
        x = np.arange(16, dtype=np.float32)[None]
        head = json.dumps(
            {
                "inputs": [
                    {"name": n, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
                    for n in ("INPUT0", "INPUT1")
                ],
                "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in ("OUTPUT0", "OUTPUT1")],
            }
        ).encode()
        body = head + x.tobytes() + x.tobytes()
        headers = [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(len(head)).encode()),
            (b"content-length", str(len(body)).encode()),
        ]

        async def http_call() -> None:
            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                pass

            await app(
                {
                    "type": "http",
                    "method": "POST",
                    "path": "/v2/models/add_sub/infer",
                    "headers": headers,
                    "state": {},
                    "query_string": b"",
                },
                receive,
                send,
            )

        from frameserve._proto import grpc_service_pb2 as pb

        message = pb.ModelInferRequest(model_name="add_sub")
        for n in ("INPUT0", "INPUT1"):
            message.inputs.add(name=n, datatype="FP32", shape=[1, 16])
            message.raw_input_contents.append(x.tobytes())
        data = message.SerializeToString()
        servicer = GrpcInferenceServicer(service)

        class Context:
            async def abort(self, code: Any, details: str) -> None:
                raise RuntimeError(details)

        async def grpc_call() -> None:
            await servicer.ModelInferRaw(data, Context())

        loop = asyncio.new_event_loop()
        request = codec.decode_request(body, len(head), model_name="add_sub")
        outputs = service.run(request)

        def per_call(fn: Callable[[], Any]) -> float:
            for _ in range(200):
                fn()
            best = float("inf")
            for _ in range(5):
                t0 = time.thread_time()
                for _ in range(calls):
                    fn()
                best = min(best, (time.thread_time() - t0) / calls * 1e6)
            return best

        us = {
            "http": per_call(lambda: loop.run_until_complete(http_call())),
            "grpc": per_call(lambda: loop.run_until_complete(grpc_call())),
            "decode": per_call(lambda: codec.decode_request(body, len(head), model_name="add_sub")),
            "submit": per_call(lambda: here.submit(request).result()),
            "encode": per_call(
                lambda: codec.encode_response(
                    model_name="add_sub", model_version="1", outputs=outputs, requested=request.outputs
                )
            ),
        }
        loop.close()
    finally:
        service.close()
    parts = (
        f"service.submit (checks, scheduler, Python backend, the model) {us['submit']:.0f} us, "
        f"codec decode {us['decode']:.0f} us, encode {us['encode']:.0f} us"
    )
    return {"http": f"the fast path {us['http']:.0f} us: {parts}", "grpc": f"ModelInfer {us['grpc']:.0f} us: {parts}"}
