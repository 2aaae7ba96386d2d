"""The records every room speaks: requests and outcomes (`requests`), the event stream (`events`) and its
one encoding (`wire`), the engine's options (`options`), the prompt (`prompts`), and the one error
hierarchy (`errors`). They import no torch and nothing above their room, which they share with the
sketch (`requests` finds a sketch's format): clients import these alone."""
