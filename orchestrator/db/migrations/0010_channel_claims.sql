-- A ChannelHub claims an inbox item before handling it (a lease), so two hubs never answer
-- one message twice (e.g. while `channel_hubs` changes and old and new hubs both run). A hub
-- that restarts under the same name takes its own claims back at once; another hub takes an
-- item over once the lease has run out.

ALTER TABLE channel_inbox
    ADD COLUMN claimed_by    text,
    ADD COLUMN claimed_until bigint NOT NULL DEFAULT 0;
