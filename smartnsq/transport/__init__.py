"""asyncio transport: connections to nsqd and the nsqlookupd lookup manager (over httpx)."""
