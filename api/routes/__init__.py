"""The API's routers, one module per resource; :mod:`api.app` mounts them under ``/v1``."""
