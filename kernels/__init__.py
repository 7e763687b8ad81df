"""Fast paths (``mmspec.kernels``), each beside a readable torch reference that tests compare
against; none yet."""
