"""Where a rewrite runs: in this process (`local`), in a daemon (`remote`, over the blocking `client`, its
wire `protocol`, `connection` and `config`), or on a Ray Serve cluster (`cluster`). Nothing here imports
torch until a local backend loads its model."""
