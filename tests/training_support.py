"""What the tests comparing two trainings of the same run share."""

from __future__ import annotations

import torch

from resstream.training.run_loading import TrainedModel

#: A bound on |one AdamW update| / lr: the bias-corrected ratio m̂/(√v̂ + ε) stays below 1 for
#: β1 ≤ √β2 (0.9 ≤ 0.975 here); 2 leaves room for the weight decay's share.
ADAM_STEP_BOUND = 2.0


def assert_same_training(
    a: TrainedModel, b: TrainedModel, *, rtol: float, atol: float, noise_share: float = 0.0
) -> None:
    """Every weight of `a` within (rtol, atol) of `b`'s, except the attention key bias, and
    except at most `noise_share` of a tensor's elements, which must still lie within the bound
    of AdamW's steps.

    The key bias's gradient is zero in exact arithmetic (softmax ignores a shift shared by all
    of a query's scores), so what AdamW sees there is rounding noise, which its normalised
    step turns into updates of up to lr each however small the noise: two code paths (several
    processes, another CPU's kernels) may move it differently by up to Σ lr_t. It cannot change
    the model's outputs, so it is checked only against that bound.

    Any other weight whose gradient is rounding noise in some steps (a unit nearly off for the
    batch) is moved the same way. Where two runs sum their gradients in different orders over
    many steps (the processes of a torchrun job), a few such elements drift apart: a
    `noise_share` > 0 holds that share of each tensor's elements (measured: 2 of 4,096 after 20
    steps on one machine) to the Adam bound only. A wrong gradient moves most of a tensor.
    """
    width = a.config.model.d_model
    bound = ADAM_STEP_BOUND * a.config.optim.lr * a.config.run.max_steps
    mine, theirs = a.model.state_dict(), b.model.state_dict()
    assert mine.keys() == theirs.keys()
    for name, value in mine.items():
        other = theirs[name]
        if name.endswith("attn.c_attn.bias"):
            key = slice(width, 2 * width)
            torch.testing.assert_close(value[key], other[key], rtol=0, atol=bound, msg=f"{name} (key)")
            value, other = _without(value, key), _without(other, key)
        torch.testing.assert_close(value, other, rtol=0, atol=bound, msg=f"{name} (Adam bound)")
        outside = int(((value - other).abs() > atol + rtol * other.abs()).sum())
        assert outside <= noise_share * value.numel(), f"{name}: {outside} of {value.numel()} elements differ"


def _without(bias: torch.Tensor, part: slice) -> torch.Tensor:
    return torch.cat([bias[: part.start], bias[part.stop :]])
