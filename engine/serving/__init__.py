"""Serving one engine to many clients: the daemon (`daemon`), its wire protocol (`protocol`) and the
blocking client (`client`). Nothing here imports torch until the daemon loads its model."""
