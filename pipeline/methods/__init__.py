"""The method programs, one module per paper, each beside its own math; `registry` names them."""
