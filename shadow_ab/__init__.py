"""shadow-ab: shadow-traffic A/B evaluation for LLM serving engines."""

from shadow_ab.records import (
    SCHEMA_VERSION,
    Endpoint,
    ExchangeRecord,
    HealthSample,
    RecordError,
    Role,
    Status,
    TokenLogprob,
    parse_exchange,
    parse_health,
    parse_record,
)

__version__ = "0.1.0"

__all__ = [
    "SCHEMA_VERSION",
    "Endpoint",
    "ExchangeRecord",
    "HealthSample",
    "RecordError",
    "Role",
    "Status",
    "TokenLogprob",
    "__version__",
    "parse_exchange",
    "parse_health",
    "parse_record",
]
