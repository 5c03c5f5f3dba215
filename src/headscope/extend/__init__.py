"""The extension API: what every analysis, built-in or plugin, is built from.

- :mod:`~headscope.extend.protocol`: ``Analysis``, its options (``option``), ``Output``, ``Outcome``,
  the registry ``ANALYSES`` and the one run path ``execute``;
- :mod:`~headscope.extend.base`: shared inputs (``Report``, ``Section``, ``RepeatSpec``), batching
  and the streaming scorer ``score_batches``;
- :mod:`~headscope.extend.checks`: ``Check``, an analysis' causal or logical check of its own tables;
- :mod:`~headscope.extend.ablation`: the ablation engine (mean ablation against random same-layer
  heads) and ``verify``;
- :mod:`~headscope.extend.render` and :mod:`~headscope.extend.writers`: the terminal and HTML
  helpers and the shared file writers an analysis' presentation uses;
- :mod:`~headscope.extend.examples`, :mod:`~headscope.extend.show`: top-activating examples and one
  text's attention.

Built-in analyses (:mod:`headscope.analyses`) import from here exactly what a plugin can, and no
name that starts with an underscore (``tests/unit/test_layers.py``). Nothing here knows any analysis.
"""
