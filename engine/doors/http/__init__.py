"""The HTTP door: OpenAI's API and the cluster's wire on the engine's session (`door`)."""
