"""Provisioning: the model cache (`store`: the known models, the cache's layout and checks), fetching the
embedded models (`fetch`), the checks of every file a load reads from the cache (`integrity`), and what
loads derive and keep there (`kept`)."""
