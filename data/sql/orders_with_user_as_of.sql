-- Beyond the seed: an event-time temporal join (FOR SYSTEM_TIME AS OF). Each order with its user's
-- name and tier as they were at the order's time: the version of the user current then, not now.
-- An order is sent once both tables' watermarks pass its time (orders' runs 5 s behind the newest
-- order_time read, user_profiles' at the newest updated_at), so the last order of each table waits
-- for a later one. An order before its user's first version, or of a deleted user, gets NULLs
-- (LEFT JOIN; an [INNER] JOIN would drop it). Times are JSON text: "2024-05-01 10:00:00.000".
-- Run: python -m pipeline sql data/sql/orders_with_user_as_of.sql

CREATE TABLE orders (
id STRING,
user_id STRING,
amount DOUBLE,
order_time TIMESTAMP(3),
WATERMARK FOR order_time AS order_time - INTERVAL '5' SECOND,
PRIMARY KEY (id) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/sql_orders',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE user_profiles (
id STRING,
name STRING,
tier STRING,
updated_at TIMESTAMP(3),
WATERMARK FOR updated_at AS updated_at,
PRIMARY KEY (id) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_profiles',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE orders_with_user_as_of (
orderId STRING,
userId STRING,
amount DOUBLE,
userName STRING,
userTier STRING,
PRIMARY KEY (orderId) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/orders_with_user_as_of',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO orders_with_user_as_of (orderId, userId, amount, userName, userTier)
SELECT
o.id,
o.user_id,
o.amount,
u.name,
COALESCE(u.tier, 'unknown')
FROM orders AS o
LEFT JOIN user_profiles FOR SYSTEM_TIME AS OF o.order_time AS u ON o.user_id = u.id;
