"""The op-agnostic engine: the manifest, dispatch, the runtime library binding and the data paths."""
