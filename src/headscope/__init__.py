"""headscope: what does every attention head in a transformer do?"""

__version__ = "0.1.0"
