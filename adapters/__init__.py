"""Platform bridge (DESIGN.md §5): shared bridge logic plus the slack/, discord/ and devchat/ adapters."""
