"""Where a run executes: `local` (child processes on this machine) or `ray`."""
