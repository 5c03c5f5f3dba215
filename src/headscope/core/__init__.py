"""The leaf every layer may import: the registries' live mapping (:mod:`.registry`), the role
record (:mod:`.rolespec`), the weight-only tables' specs (:mod:`.weighttables`) and the notices a
command holds until its run goes on (:mod:`.held`). It imports nothing of headscope but
:mod:`headscope.errors`."""
