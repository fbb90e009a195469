"""Multi-turn generation on one route, shared by the HF backend tests (CPU and CUDA)."""


async def three_turns(backend, prompt, route, obs, sampling):
    """Three generations on ``route``: each turn's prompt is the last one plus its output and the
    observation ids ``obs`` (so later turns resume the route's parked row). The three Generations."""
    gens = []
    for _ in range(3):
        gen = await backend.generate(prompt, sampling, route=route)
        gens.append(gen)
        prompt = prompt + gen.token_ids + obs
    return gens
