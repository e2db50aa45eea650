"""resstream.stream: the component grammar opened to the user's own model.

`trace` reads any named activation (`sites`), `edited` installs edits (`edits`) as hooks on
the model for as long as a `with` block runs; both are built on `capture` and the
intervention engine's operations and hook points.
"""
