-- The seed's second example: each user with their favourite colour and cheese, re-emitted
-- whenever any of the three changelog topics changes.
-- Run: python -m pipeline sql data/sql/user_favorite_color_and_cheese.sql

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

CREATE TABLE user_favorite_color (
userUid STRING,
favoriteColor STRING,
PRIMARY KEY (userUid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_favorite_color',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE user_favorite_cheese (
userUid STRING,
favoriteCheese STRING,
PRIMARY KEY (userUid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_favorite_cheese',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE user_favorite_color_and_cheese (
accountId STRING,
userUid STRING,
favoriteColor STRING,
favoriteCheese STRING,
PRIMARY KEY (userUid) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_favorite_color_and_cheese',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO user_favorite_color_and_cheese (accountId, userUid, favoriteColor, favoriteCheese)
SELECT
u.accountId,
u.uid,
ufcol.favoriteColor,
ufchz.favoriteCheese
FROM users u
LEFT JOIN user_favorite_color ufcol
ON u.uid = ufcol.userUid
LEFT JOIN user_favorite_cheese ufchz
ON u.uid = ufchz.userUid;
