"""The Rust half of memwall: the `memwall` command line's library, run on an argument vector."""

from typing import List, Optional, Tuple

__version__: str

def run(argv: List[str], config_json: Optional[str] = None) -> Tuple[bool, str]:
    """Runs one `memwall` argument vector (without the program name); `(True, report)` or
    `(False, error lines)`. `config_json` is the text of a config.json every model is resolved
    from (the --model value is then its label)."""
