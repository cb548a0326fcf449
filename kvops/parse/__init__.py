"""Pure parsers of tool output. Each returns what it could read plus warnings; none raises on
partial or truncated input (a truncated line becomes a warning)."""
