"""The evidence side: models, data, optimizers, strategies, monitor and grid runner. Imports torch lazily."""

import logging

# Libraries' import-time notices that say nothing to a user of advisor on a machine like theirs: torchao's
# "Failed to load _C_mxfp8...so" (CUDA kernels absent on a CPU), bitsandbytes' "Failed to load CPU
# gemm_4bit_forward from kernels-community", torch's "register_constant() on Enum subclasses is deprecated"
# (torchao's registrations). Errors still show.
for _name in ("torchao", "bitsandbytes", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
