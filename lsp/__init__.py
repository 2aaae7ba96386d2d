"""specedit's language server: rewrites streamed into editors as versioned text-document edits."""
