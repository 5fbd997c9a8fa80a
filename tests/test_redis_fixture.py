from tests.support.redis_servers import RedisServer


def test_redis_server_is_real_and_restartable(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set("k", "v")
    assert client.get("k") == "v"
    redis_server.kill()
    redis_server.start()
    assert redis_server.client().get("k") is None  # no persistence: a restart is empty
