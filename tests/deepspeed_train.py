"""Train a tiny model with ``deepspeed.initialize`` from an exported ``ds_config.json``.

Run in its own process (``DS_ACCELERATOR=cpu``, one gloo rank): DeepSpeed picks its accelerator
at import and initialises ``torch.distributed``, neither of which a test process should keep.
Writes, as JSON: the LR of every optimizer step, DeepSpeed's own batch triple and clipping, and
whether it runs the forward under autocast, and which gradients it would all-reduce in
the lower precision.

Usage: python deepspeed_train.py DS_CONFIG.json OUT.json OPTIMIZER_STEPS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29533")

import deepspeed
import deepspeed.ops

# DeepSpeed's shared-memory all-reduce for CPUs is a C++ extension compiled on first use
# (about a minute); one rank never all-reduces, so it is not built.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def main(config_path: str, out_path: str, steps: int) -> None:
    config = json.loads(Path(config_path).read_text())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    engine, _, _, _ = deepspeed.initialize(model=model, config=config)
    micro = engine.train_micro_batch_size_per_gpu()
    lrs = []
    while len(lrs) < steps:
        x = torch.randn(micro, 4)
        loss = torch.nn.functional.cross_entropy(engine(x), (x[:, 0] > 0).long())
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():
            lrs.append(engine.optimizer.param_groups[0]["lr"])  # the LR this step applies
        engine.step()
    result = {
        "lrs": lrs,
        "train_batch_size": engine.train_batch_size(),
        "micro_batch_size": micro,
        "accumulation_steps": engine.gradient_accumulation_steps(),
        "gradient_clipping": engine.gradient_clipping(),
        "torch_autocast": engine.torch_autocast_enabled(),
        "optimizer": type(engine.optimizer).__name__,
        # parameters whose gradients DeepSpeed all-reduces in the autocast dtype, not fp32
        "reduced_in_lower_precision": [
            name for name, p in model.named_parameters() if hasattr(p, "comm_dtype")
        ],
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
