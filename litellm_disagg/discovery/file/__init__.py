"""The file backend: one JSON file per worker in a local directory, no server needed (the default).

``settings`` (``FileRegistrySettings``, the default directory), then ``registry`` (``FileRegistry``).
"""
