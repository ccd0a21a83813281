"""``python -m rankmesh.torch``: builds the C++ backend ahead of a job (into
``$RANKMESH_TORCH_CACHE``) and prints its path."""

from . import build

print(build())
