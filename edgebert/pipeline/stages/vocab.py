"""vocab: drop the tokens the task's text never uses, from the embedding rows and the tokenizer together.

The stage's model folder holds the pruned tokenizer; compile re-encodes the data with it, so later
stages, the eval arrays and the bundle (tokenizer.json, vocab.txt, MediaPipe metadata) all use the new ids."""

from edgebert import checkpoint, tokenizer as tokenization
from edgebert.passes import VocabConfig, prune_vocab

from ..context import task_model
from .registry import Stage, register


def run(ctx, state, options: VocabConfig, dest, work) -> dict:
    result = prune_vocab(task_model(state.model, ctx.task), options, ctx.data, work_dir=work)
    checkpoint.save(result.model, dest / "model")
    tokenization.save(result.tokenizer, dest / "model")
    return {**result.record.to_dict(), "new_tokenizer": True}  # compile re-encodes the data with it


register(Stage(name="vocab", options=VocabConfig, run=run, keyed_by_code=True))
