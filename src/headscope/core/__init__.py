"""The leaf every layer may import: the registries' live mapping (:mod:`.registry`), the role
record (:mod:`.rolespec`) and the weight-only tables' specs (:mod:`.weighttables`). It imports
nothing of headscope but :mod:`headscope.errors`."""
