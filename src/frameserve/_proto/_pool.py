"""frameserve's own protobuf descriptor pool.

Our .proto files reuse Triton's package and names (``inference.ModelConfig``, ...) so that the
wire format matches; registering them in protobuf's default pool would clash with any other copy
of those names in the process (tritonclient's generated modules, for one). Every generated
module here adds its file to :data:`POOL` instead (scripts/gen_proto.sh rewrites them so).
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
"""The pool that holds ``model_config.proto`` and ``grpc_service.proto``."""
