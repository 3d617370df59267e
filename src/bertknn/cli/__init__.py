"""The command line, `bertknn`: the app, its one error handler and its shared options in main.py; the commands, by what
they work on, in store_commands.py (build, ask, index, sentences, add, remove, verify, repair, ...), lama.py (data lama,
eval lama, tune, train-head), eval_edits.py (eval edits) and serve.py (serve, demo), registered on the app when this
package is imported. Commands only wire options to the library: what they do is in the module of its concept.
"""

from bertknn.cli import eval_edits, lama, serve, store_commands  # registers their commands on the app
from bertknn.cli.main import app

__all__ = ["app", "eval_edits", "lama", "serve", "store_commands"]
