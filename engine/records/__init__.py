"""The records every room speaks: requests and outcomes (`requests`) with their stats (`stats`), the event
stream (`events`) and its one encoding (`wire`), the engine's options (`options`), the prompt (`prompts`),
and the one error hierarchy (`errors`). They import no torch and no other room: they are the lowest, and clients import
these alone."""
