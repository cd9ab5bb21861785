-- The seed's first example: users per account, kept right through updates, moves and deletes.
-- Run: python -m pipeline sql data/sql/user_count_by_account.sql

CREATE TABLE users (
uid STRING,
accountId STRING,
id INT,
fullName STRING,
op STRING,
eventTime TIMESTAMP(3) METADATA,
properties MAP<STRING, STRING> METADATA ,
topic STRING METADATA VIRTUAL,
sequenceId BIGINT METADATA VIRTUAL,
PRIMARY KEY (uid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/users',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE user_count_by_account (
accountId STRING,
userCount BIGINT,
PRIMARY KEY (accountId) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_count_by_account',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO user_count_by_account (accountId, userCount)
SELECT accountId, COUNT(1) AS userCount
FROM users
GROUP BY accountId;
