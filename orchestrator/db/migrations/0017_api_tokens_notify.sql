-- Replicas cache verified tokens (issue 17). Every change to a token row (revoked, deleted,
-- its user or admin flag edited, by the API or by hand in psql) tells every replica, at
-- commit, to drop that token from its cache: NOTIFY orch_tokens '<token_hash>'.

CREATE FUNCTION api_tokens_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('orch_tokens', OLD.token_hash);
    RETURN NULL;
END;
$$;

CREATE TRIGGER api_tokens_notify
    AFTER UPDATE OR DELETE ON api_tokens
    FOR EACH ROW EXECUTE FUNCTION api_tokens_notify();
