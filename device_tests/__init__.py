"""The on-device benchmark harness: copied to a phone or board and run there.

It needs only numpy and one runtime (`runtimes.py` lists them: onnxruntime, ai-edge-litert, ...), plus tokenizers
for `run --text` alone (text.py imports it), so it must never import torch, transformers or any
edgebert package.
"""

__version__ = "1"


class HarnessError(Exception):
    """Bad input or a broken device environment; the message names the problem and the fix."""
