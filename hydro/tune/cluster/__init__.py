"""The Ray cluster a Hydro run uses: joining it (credentials), its sessions, and how much of Ray's output shows."""
