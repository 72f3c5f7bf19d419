-- Tokens with an optional expiry, and when each was last used (issue 20).
-- expires_at: Unix ms; NULL = never. An expired token is refused like a revoked one.
-- last_used_at: Unix ms, written by each replica at most once a minute per token (batched,
-- off the request path), so it may lag by up to a minute.
ALTER TABLE api_tokens ADD COLUMN expires_at bigint;
ALTER TABLE api_tokens ADD COLUMN last_used_at bigint;

-- Migration 0017 notifies every replica to drop a token from its cache on any change to its
-- row. Recording last use changes the row every minute: without this condition, every hot
-- token would be dropped from every cache every minute. Any other change still notifies.
DROP TRIGGER api_tokens_notify ON api_tokens;
CREATE TRIGGER api_tokens_notify
    AFTER UPDATE ON api_tokens
    FOR EACH ROW
    WHEN ((to_jsonb(OLD) - 'last_used_at') IS DISTINCT FROM (to_jsonb(NEW) - 'last_used_at'))
    EXECUTE FUNCTION api_tokens_notify();
CREATE TRIGGER api_tokens_notify_delete
    AFTER DELETE ON api_tokens
    FOR EACH ROW EXECUTE FUNCTION api_tokens_notify();
