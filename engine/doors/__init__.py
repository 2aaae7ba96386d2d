"""The front ends that serve the engine beside the command line and the language server: the daemon's
host (`daemon`, msgpack over a socket, and its rewrites, `daemon_jobs`), the budget of connections every
network door keeps (`listening`), the HTTP door (`http/`: OpenAI's API and the cluster's wire), the Ray
Serve replica and its deploy (`cluster_deploy`), and `specedit bench` and `specedit calibrate` (`bench/`)."""
