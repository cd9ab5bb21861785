-- A statement set (beyond the seed): two INSERTs over the seed's users topic, one query reading
-- each message once, and a view that one of them reads.
-- Run: python -m pipeline sql data/sql/account_counts_and_named_users.sql

CREATE TABLE users (
uid STRING,
accountId STRING,
id INT,
fullName STRING,
PRIMARY KEY (uid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/users',
'key.format' = 'raw',
'value.format' = 'json'
);

CREATE TABLE user_count_by_account (
accountId STRING,
userCount BIGINT,
PRIMARY KEY (accountId) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_count_by_account',
'key.format' = 'raw',
'value.format' = 'json'
);

CREATE TABLE user_names (
uid STRING,
accountId STRING,
name STRING,
PRIMARY KEY (uid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_names',
'key.format' = 'raw',
'value.format' = 'json'
);

-- users with a name, the name in capitals
CREATE TEMPORARY VIEW named AS
SELECT uid, accountId, UPPER(fullName) AS name
FROM users
WHERE fullName IS NOT NULL;

EXECUTE STATEMENT SET
BEGIN
INSERT INTO user_count_by_account SELECT accountId, COUNT(1) FROM users GROUP BY accountId;
INSERT INTO user_names SELECT uid, accountId, name FROM named;
END;
