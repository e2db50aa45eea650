"""The Python API the CLI mirrors: one module per command (`resstream.api.shift`, `.lens`,
`.attribute`, `.decompose`, `.neurons`, `.composition`, `.recency`, `.simulate`, `.tune_lens`,
`.compare`, `.routes`, `.train`, `.sweep`, `.verify`; `load_lens` in `.decoders`), each function re-exported
at the top as `resstream.shift` etc.

Every function accepts its models as spec strings (run directory, Hugging Face directory or
hub name, "reference") or as models already in memory with their tokenizer, samples the
corpus, runs the analysis (`resstream.analysis`) and returns one frozen, typed result, whose
repr is a few lines (`resstream.reprs.summary`) and whose `to_dict()` holds everything.
Library errors name the functions' parameters; the CLI shows them as flags. The functions
are quiet: `progress=True` shows progress bars (the CLI passes it unless `--quiet`).

The functions are not re-exported here, so that `resstream.api.shift` stays the module
(with `ShiftReport` beside the function) rather than being shadowed by the function.
"""
