"""From a model config and a sharding plan to a per-device program: shapes, formats, routing, floors."""
