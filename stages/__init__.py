"""The three DVC stage scripts (split, encode, score) and their shared plumbing; logic lives in recallk."""
