"""Generated protobuf and gRPC modules for Triton's ``inference`` package (see README.md here).

Rank 0 in the layer table: generated code, importing nothing of frameserve. Only
``frameserve.protocol.grpc`` and the ``config.pbtxt`` reader import it.
"""
