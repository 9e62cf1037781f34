;; Hand-written ALFWorld problem for the adapter's tests (domain: the package's alfred.pddl).
;; A potato in a closed fridge, a microwave, a dining table with a spoon on it.
;; Task (pick_heat_then_place_in_recep): put a hot potato on the dining table.
(define (problem plan_tiny_hot_potato)
    (:domain alfred)
    (:objects
        agent1 - agent
        PotatoType - otype
        SpoonType - otype
        FridgeType - rtype
        MicrowaveType - rtype
        DiningTableType - rtype
        Potato_bar__minus_00_dot_50_bar__plus_01_dot_10_bar__minus_02_dot_20 - object
        Spoon_bar__plus_01_dot_10_bar__plus_00_dot_75_bar__plus_00_dot_30 - object
        Fridge_bar__minus_00_dot_40_bar__plus_00_dot_00_bar__minus_02_dot_30 - receptacle
        Microwave_bar__plus_01_dot_60_bar__plus_00_dot_90_bar__minus_02_dot_10 - receptacle
        DiningTable_bar__plus_01_dot_20_bar__plus_00_dot_70_bar__plus_00_dot_40 - receptacle
        loc_bar_0_bar_0_bar_0_bar_60 - location
        loc_bar__minus_2_bar__minus_6_bar_2_bar_30 - location
        loc_bar_6_bar__minus_6_bar_2_bar_30 - location
        loc_bar_4_bar_2_bar_1_bar_45 - location
    )
    (:init
        (atLocation agent1 loc_bar_0_bar_0_bar_0_bar_60)
        (receptacleAtLocation Fridge_bar__minus_00_dot_40_bar__plus_00_dot_00_bar__minus_02_dot_30 loc_bar__minus_2_bar__minus_6_bar_2_bar_30)
        (receptacleAtLocation Microwave_bar__plus_01_dot_60_bar__plus_00_dot_90_bar__minus_02_dot_10 loc_bar_6_bar__minus_6_bar_2_bar_30)
        (receptacleAtLocation DiningTable_bar__plus_01_dot_20_bar__plus_00_dot_70_bar__plus_00_dot_40 loc_bar_4_bar_2_bar_1_bar_45)
        (receptacleType Fridge_bar__minus_00_dot_40_bar__plus_00_dot_00_bar__minus_02_dot_30 FridgeType)
        (receptacleType Microwave_bar__plus_01_dot_60_bar__plus_00_dot_90_bar__minus_02_dot_10 MicrowaveType)
        (receptacleType DiningTable_bar__plus_01_dot_20_bar__plus_00_dot_70_bar__plus_00_dot_40 DiningTableType)
        (openable Fridge_bar__minus_00_dot_40_bar__plus_00_dot_00_bar__minus_02_dot_30)
        (openable Microwave_bar__plus_01_dot_60_bar__plus_00_dot_90_bar__minus_02_dot_10)
        (objectType Potato_bar__minus_00_dot_50_bar__plus_01_dot_10_bar__minus_02_dot_20 PotatoType)
        (objectType Spoon_bar__plus_01_dot_10_bar__plus_00_dot_75_bar__plus_00_dot_30 SpoonType)
        (pickupable Potato_bar__minus_00_dot_50_bar__plus_01_dot_10_bar__minus_02_dot_20)
        (pickupable Spoon_bar__plus_01_dot_10_bar__plus_00_dot_75_bar__plus_00_dot_30)
        (heatable Potato_bar__minus_00_dot_50_bar__plus_01_dot_10_bar__minus_02_dot_20)
        (coolable Potato_bar__minus_00_dot_50_bar__plus_01_dot_10_bar__minus_02_dot_20)
        (inReceptacle Potato_bar__minus_00_dot_50_bar__plus_01_dot_10_bar__minus_02_dot_20 Fridge_bar__minus_00_dot_40_bar__plus_00_dot_00_bar__minus_02_dot_30)
        (objectAtLocation Potato_bar__minus_00_dot_50_bar__plus_01_dot_10_bar__minus_02_dot_20 loc_bar__minus_2_bar__minus_6_bar_2_bar_30)
        (inReceptacle Spoon_bar__plus_01_dot_10_bar__plus_00_dot_75_bar__plus_00_dot_30 DiningTable_bar__plus_01_dot_20_bar__plus_00_dot_70_bar__plus_00_dot_40)
        (objectAtLocation Spoon_bar__plus_01_dot_10_bar__plus_00_dot_75_bar__plus_00_dot_30 loc_bar_4_bar_2_bar_1_bar_45)
        (canContain FridgeType PotatoType)
        (canContain MicrowaveType PotatoType)
        (canContain DiningTableType PotatoType)
        (canContain DiningTableType SpoonType)
    )
    (:goal
        (and
            (exists (?r - receptacle)
                (exists (?o - object)
                    (and
                        (heatable ?o)
                        (objectType ?o PotatoType)
                        (receptacleType ?r DiningTableType)
                        (isHot ?o)
                        (inReceptacle ?o ?r)
                    )
                )
            )
        )
    )
)
