"""`edited(model, edits)`: the user's own model, edited for as long as a `with` block runs.

    with resstream.edited(model, [resstream.Add("L6.resid", vector, coef=4.0)]):
        model.generate(...)          # any call: a forward, generate, another library's loop

The edits (`stream.edits`) are checked against the model first (one-line UsageError, nothing
installed), then installed as hooks through the model's adapter (`stream.hooks`), so the same
names mean the same activations on every family; the hooks are removed when the block ends,
also on an exception, leaving the model exactly as it was (its weights are never touched).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch import nn

from resstream.models.adapters import view_of
from resstream.models.adapters.base import ModelView
from resstream.models.loaded import LoadedModel
from resstream.stream.edits import StreamEdit, resolve
from resstream.stream.hooks import install


def view_for(model: nn.Module | ModelView | LoadedModel) -> ModelView:
    """The adapter's view of a model object (a Hugging Face causal LM, resstream's GPT), of a
    loaded model, or the view itself."""
    if isinstance(model, ModelView):
        return model
    if isinstance(model, LoadedModel):
        return model.view
    return view_of(model)


@contextmanager
def edited(
    model: nn.Module | ModelView | LoadedModel, edits: StreamEdit | Sequence[StreamEdit]
) -> Iterator[nn.Module]:
    """Run `model` under `edits` inside the block (module docstring); yields the model itself.

    `edits` are `Set`, `Add`, `Scale`, `Project`, `Clamp` and `Apply` on the component grammar
    (``L6.resid``, ``L3.H2``, ``L5.N1031``, ``L4.mlp``, ``@p`` for one position); several act
    together, in the order given where they share a site. An edit's positions are positions of
    the whole sequence, also when `generate` feeds the model one new token at a time."""
    view = view_for(model)
    handles = install(view, resolve(edits, view))
    try:
        yield view.model
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["edited", "view_for"]
